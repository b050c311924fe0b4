"""Generated modules for the PodResources API v1 (``api_pb2``, ``api_pb2_grpc``)."""
