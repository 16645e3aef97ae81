"""`gwtf-node`: the volunteer's, sponsor's and auditor's command line (``main.main``)."""
