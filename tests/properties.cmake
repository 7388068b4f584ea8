# Property tests: hundreds of random meshes, shapes, specs and dtypes per run (seed printed;
# SHARD_PROPERTY_SEED / SHARD_PROPERTY_CASE replay a failure), at every registered rank count
# and devices per rank, so the meshes cover 1-8 devices.
shard_mpi_test_binary(test_properties mpi/test_properties.cpp)
shard_add_mpi_test(test_properties TIMEOUT 120)
