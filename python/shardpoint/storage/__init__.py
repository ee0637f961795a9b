"""The storage face: checkpoints as files of named tensors and values (paths and URLs, save,
read, write, merge), the Python objects and dtypes they hold, io modes, async saves, digests."""
