"""The numpy interpreter of kernels and its host views of arguments."""
