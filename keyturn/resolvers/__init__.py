"""Resolvers: translate GraphQL arguments into runtime calls and check them.

They return runtime records; the schema's types wrap them, so the imports run
one way (schema → resolvers → runtime). Errors are not caught here: what a
client may see of a domain error is decided once, in
:mod:`keyturn.schema.errors`.
"""
