"""A run without pytest: options, profiles, servers (launch, restart), the session."""
