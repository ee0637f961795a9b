"""Trainers that save for the user: one line makes shardpoint their checkpoint format.

Each submodule imports without its framework installed (the framework is imported when one of
its classes or functions is used) and needs its extra: ``shardpoint[lightning]``,
``shardpoint[transformers]``, ``shardpoint[accelerate]``, ``shardpoint[deepspeed]``.

* :mod:`shardpoint.integrations.lightning`: ``Trainer(plugins=[ShardpointCheckpointIO()])``
* :mod:`shardpoint.integrations.hf_trainer`: ``ShardpointTrainer`` in place of ``Trainer``
* :mod:`shardpoint.integrations.accelerate`: ``use_shardpoint(accelerator)``
* :mod:`shardpoint.integrations.deepspeed`: ``ShardpointCheckpointEngine``

See docs/INTEGRATIONS.md.
"""
