"""`gwtf-node devnet`: an in-process EVM served as JSON-RPC, with the contracts deployed."""
