"""Where the node talks to the chain: the web3 adapter and its port, one function per
transaction, the deployment file naming the contracts, and the keystores that sign."""
