"""Replaying real cluster traces (the Alibaba 2023 GPU trace) through gpud's scheduling core."""
