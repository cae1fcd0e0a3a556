"""Drive load against a server and sample it: the client and its streams, wire formats, prompts, client processes,
negotiation with unknown servers, the server-side scrape, one way to run a level, and the level's numbers.
Imports nothing of judge, record or report."""
