"""The semantic cache verifier's parts: tokens (text.py), the explicit checks (checks.py), the pair
model's features (features.py) and coefficients (model.py, weights.json). acceptance.verify runs them."""
