"""A site relay: one cloud connection for every robot of a site (``robofleet relay``)."""
