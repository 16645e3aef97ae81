"""Finding the run's peers (address book, DHT, hints, exchange), admitting only the chain's
members, and choosing a joiner's stage from what peers say of themselves."""
