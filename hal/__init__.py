"""Robots as schedulable resources: specs, drivers, discovery, leasing beside GPUs."""
