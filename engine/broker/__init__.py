"""The broker front end: ``controller.Broker`` (BrokerController's start/shutdown), the asyncio ``server`` and
its ``ioworker`` processes, the request ``processors``, the ``repeat`` route, ``acl``, ``admin`` queries,
``config`` (BrokerConfig from broker.properties via ``java_properties``), ``metrics`` and
the 5.x ``grpc_endpoint``. ``engine.Broker`` and ``engine.BrokerConfig``
are the public names."""
