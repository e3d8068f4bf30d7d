"""Workload profiles: the numbers that describe a workload and what they mean
for the tiers, from a trace (``kvstore profile TRACE``) or from the traffic a
running server sees (:mod:`kvstore.profile.live`, ``kvstore profile --server``).

Modules: ``load`` (trace formats), ``dist`` (percentiles), ``quadrants`` (the
length thresholds that name a workload), ``lengths``, ``arrival``, ``reuse``,
``sessions`` (one section each), ``curves`` (the replay: hit rate against
capacity), ``sizing`` (GB per tier and a ``kvstore.toml`` fragment),
``report`` (assembly), ``text`` and ``plots`` (output), ``live`` (the server's
sliding window), ``wire`` (its gRPC form), ``prom`` (its Prometheus gauges),
``cli``. Nothing heavy is imported here.
"""
