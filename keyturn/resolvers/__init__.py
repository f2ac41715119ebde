"""Resolvers: translate GraphQL arguments into runtime calls and check them.

They return runtime and table objects; the schema's types wrap them, so the
imports run one way (schema → resolvers → runtime).
"""
