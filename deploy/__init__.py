"""Deployment helpers: compose files, images, Ray cluster and Kubernetes manifests."""
