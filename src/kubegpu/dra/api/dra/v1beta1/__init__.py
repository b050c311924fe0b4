"""Generated modules for the dra API v1beta1 (``api_pb2``, ``api_pb2_grpc``)."""
