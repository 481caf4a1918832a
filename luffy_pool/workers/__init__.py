"""LUFFY's FSDP worker and actor: the mixed loss on top of verl's data-parallel actor."""
