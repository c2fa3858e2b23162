"""Packaging: metadata lives in pyproject.toml; this maps csrc_triton/ into the package."""

from setuptools import setup

setup(
    packages=["sgl_convwin", "sgl_convwin.csrc_triton"],
    package_dir={"sgl_convwin": "sgl_convwin", "sgl_convwin.csrc_triton": "csrc_triton"},
)
