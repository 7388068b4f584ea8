// shard_info: the ranks, hosts and logical devices of this job, and the default mesh
// (what jax.devices() and jax.process_index() show in JAX).
//
//   mpirun -n 2 shard_info --devices-per-rank 2

#include <sstream>

#include "common/cli.hpp"
#include "shard/shard.hpp"

int main(int argc, char** argv) {
  return shard::apps::run_app(argc, argv, [&](shard::Runtime& rt) {
    namespace po = shard::apps::po;
    po::options_description options("shard_info options");
    shard::apps::add_common_options(options);
    po::variables_map vm;
    if (!shard::apps::parse_command_line(argc, argv, options, vm, rt,
                                         "Usage: mpirun -n N shard_info [--devices-per-rank K]\n"
                                         "Lists the ranks, hosts and logical devices of the job."))
      return 0;

    char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
    int len = 0;
    MPI_Get_library_version(version, &len);
    std::string mpi_version(version, static_cast<std::size_t>(len));
    mpi_version = mpi_version.substr(0, mpi_version.find_first_of(",\n"));

    std::ostringstream os;
    os << "Shard: " << rt.device_count() << " devices on " << rt.process_count() << " ranks ("
       << rt.devices_per_rank() << " per rank) on " << rt.node_count() << " host(s)\n";
    os << "MPI: " << mpi_version << ", thread level " << rt.thread_level() << "\n";
    os << "BLAS: " << shard::blas_summary() << "\n\n";
    os << "devices (jax.devices()):\n";
    for (const auto& d : rt.devices())
      os << "  " << shard::device_label(d.id) << "  rank " << d.process_index << "  local " << d.local_index
         << "  node " << d.node_id << "  host " << d.host << "\n";
    const shard::Mesh mesh = shard::make_mesh({rt.device_count()}, {"devices"});
    os << "\ndefault mesh: " << mesh.to_string() << " devices " << mesh.devices_string() << "\n";
    if (rt.devices_per_rank() > 1 || rt.node_count() > 1) {
      const int per_node = rt.process_count() / rt.node_count();
      if (per_node * rt.node_count() == rt.process_count()) {
        const shard::Mesh hybrid = shard::make_mesh({rt.node_count(), per_node, rt.devices_per_rank()},
                                                    {"host", "rank", "local"});
        os << "hybrid mesh:  " << hybrid.to_string() << " devices " << hybrid.devices_string() << "\n";
      }
    }
    shard::apps::print0(rt, os.str());
    return 0;
  });
}
