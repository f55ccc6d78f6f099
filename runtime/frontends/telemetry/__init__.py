"""What transports add to be watched: the access logs of REST and gRPC, and the metrics port's app."""
