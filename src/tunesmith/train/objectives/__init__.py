"""Objectives beside the loop: preference losses (DPO family, KTO) and reward models."""
