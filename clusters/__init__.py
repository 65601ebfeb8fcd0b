"""Beam's cluster runners on one machine, for the tests, the benchmarks and a
user trying the jobs before a real cluster: a Flink session cluster, a Spark
standalone cluster and Beam's Prism runner, each fetched through its
registry's own client (Maven, pip, go), pinned and verified, and cached
outside the repository (``artifacts``); started and stopped whatever
happens (``flink``, ``spark``, ``workers``).

    python -m clusters fetch all        # once: every jar and binary
    python -m clusters flink            # a session cluster until Ctrl-C,
                                        # printing the jobs' runner flags

Nothing here is installed on a worker or imported by the jobs.
"""
