"""The surface syntax: the Lark grammar's parser, the AST, its builder and syntax diagnostics."""
