"""Generated modules for the dra API v1 (``api_pb2``, ``api_pb2_grpc``)."""
