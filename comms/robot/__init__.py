"""The robot side: the gRPC client (enrollment, heartbeat, control, remote inference), the
experience uploader, weight receiving and subscriptions (gRPC or a relay's fan-out), episode
mark sending."""
