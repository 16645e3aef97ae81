"""`gwtf-node devnet`: anvil as a child process (or an embedded eth-tester chain where anvil is
not installed), with the contracts deployed."""
