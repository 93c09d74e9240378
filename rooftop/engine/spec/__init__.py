"""Speculative decoding: drafters (n-gram prompt lookup, MTP), verification of the drafts in one step, acceptance."""
