"""Data: the SynthScenes world, its shards, and the webdataset stream every model trains on."""
