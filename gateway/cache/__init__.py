"""The semantic cache: the engine (gateway/cache/engine.py), its keys, embedder, verifier, indexes
and the operators' writes. Importing the package starts nothing: the engine's embedder thread and
database pool are made on first use."""
