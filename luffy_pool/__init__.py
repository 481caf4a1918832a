"""luffy_pool package."""
