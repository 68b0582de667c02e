"""Edge-to-cloud transport: protobuf schemas, gRPC services, auth, chunked weight distribution, site relay."""
