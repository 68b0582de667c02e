"""Which rows a batch draws: the view samplers see, the samplers and the rate limiter."""
