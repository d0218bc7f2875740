"""What every layer above the agent shares: the error types and the rules for text from a host
(shown safely, secrets masked). Imports nothing of the cockpit."""
