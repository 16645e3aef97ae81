"""``gwtf-node export``: a run's trained model taken from its nodes into one Hugging Face
checkpoint. ``gather.py`` fetches every part's weights over p2p, ``assembly.py`` checks that they
make one model at one step, ``gwtf.node.training.hf_export`` maps it to the HF layout and
``writer.py`` writes the files."""
