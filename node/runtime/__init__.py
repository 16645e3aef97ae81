"""The live node's services over the p2p layer: gradient averaging among stage replicas."""
