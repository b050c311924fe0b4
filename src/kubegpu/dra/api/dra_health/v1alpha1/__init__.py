"""Generated modules for the dra-health API v1alpha1 (``api_pb2``, ``api_pb2_grpc``)."""
