"""Edge agent: control loop, intervention sources, episode recording, uplink spool, weight apply."""
