"""Qwen3-TTS on the PyTorch engine: the talker and code predictor (:mod:`.model`), the requests it
takes (:mod:`.request`), a step's frames (:mod:`.sampler`) and the engine (:mod:`.engine`)."""
