"""Checkpointing of FSDP2 actors: sharded DCP save/load, HF export, and the on-disk layout rules."""

from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
from verl.utils.checkpoint.hf_export import gather_full_state_dict, load_dcp_model_state, write_hf_folder

__all__ = ["FSDPCheckpointManager", "gather_full_state_dict", "load_dcp_model_state", "write_hf_folder"]
