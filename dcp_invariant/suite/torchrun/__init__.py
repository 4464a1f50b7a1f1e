"""Running torch's own torchrun agent under the compatibility guard, and its worker."""
