"""dcp-invariant: proves that PyTorch Distributed Checkpoint resumes are exact."""

__version__ = "0.2.0"
