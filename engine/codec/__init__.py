"""The wire: RemotingCommand frames (JSON and ROCKETMQ headers, streaming decode) and HeartbeatData bodies.

Compiled modules ``_frame`` and ``_heartbeat`` (pyx/codec/) with their pure-Python twins ``_frame_py`` and
``_heartbeat_py``; ``heartbeat`` encodes heartbeats and fingerprints them; ``enums`` and ``errors`` are the
protocol's codes and this project's typed errors; ``vectors`` loads the real clients' captured frames.
The package ``engine`` re-exports the public names (``engine.FrameDecoder``, ``engine.decode_heartbeat``...).
"""
