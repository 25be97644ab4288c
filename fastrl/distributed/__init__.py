"""Collection and gradient averaging beyond one process and one thread, plugged into ``fastrl.run``:
``torchrun`` (DDP ranks), ``actors`` (IMPALA/APPO actor processes and their shared-memory slot ring),
``ray_actors`` (the same actors on Ray), ``async_collect`` (overlapped env and policy steps), ``seeding`` (seeds per
rank, actor and member)."""
