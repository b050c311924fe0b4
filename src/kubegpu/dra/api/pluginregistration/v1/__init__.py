"""Generated modules for the pluginregistration API v1 (``api_pb2``, ``api_pb2_grpc``)."""
