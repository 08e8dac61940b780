"""The Hugging Face room: our configs and parameters ↔ transformers' GPT-2 and Llama.

    mapping.py     which family a config is, and its config.json
    weights.py     parameter trees ↔ safetensors names and layouts
    load.py        read a Hugging Face folder on disk (weights, config, tokenizer)
    export.py      write a run as a folder transformers loads (`python -m transformer export`)

May import: config/, model/, data/tokenizers, checkpoint.py (export restores a run), cli.py.
Never: scaling/, tools/ or the command lines.
"""
