"""Deploy orchestration: a deployment brought up through its engine adapter (`rooftop/adapters/`) and the
process supervisor (`rooftop/launch/`), checked serving and placed, inventoried, then taken down."""
