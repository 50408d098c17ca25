"""What the hardware holds: GPU presets (``gpus``), model shapes (``models``) and vLLM's start-up
sizing of the KV pool from them (``capacity``)."""
