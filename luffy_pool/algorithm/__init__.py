"""LUFFY's algorithm as pure tensor functions: mixed advantage, shaped on/off-policy loss, loss selection."""
