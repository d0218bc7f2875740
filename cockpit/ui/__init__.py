"""The Textual cockpit. Only this package imports Textual; it renders HostState and posts
messages, and never waits on the network."""
