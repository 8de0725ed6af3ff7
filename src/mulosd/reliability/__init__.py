"""The reliability battery: resume after kill -9, atomic writes, fuzzed shards, config errors, safe loading,
NaN guards and DDP, each promise tested by counting (python -m mulosd.reliability)."""
