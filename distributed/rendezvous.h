// Where data-parallel workers meet, the way PyTorch users know it: torchrun's
// environment variables (a TCPStore served by rank 0), or a file that every
// worker on one machine can reach (a FileStore).
#pragma once

#include <string>

namespace sheaf {

struct Rendezvous {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;        // this worker's index on its machine (LOCAL_RANK; default: rank)
  std::string master_addr;   // TCPStore: the address rank 0 listens on
  int master_port = 0;
  std::string file;          // FileStore instead of TCP when not empty

  // RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and LOCAL_RANK, as torchrun and
  // scripts/launch.sh set them. Without WORLD_SIZE: one worker (rank 0 of 1).
  // A malformed or missing variable is a UserError naming it.
  static Rendezvous from_env();
  // One machine, no ports: `path` must not exist yet, and be reachable by all.
  static Rendezvous file_store(std::string path, int rank, int world_size);

  bool distributed() const { return world_size > 1; }
  // UserError unless world_size >= 1 and rank is in 0..world_size-1 (a
  // Rendezvous filled in by hand is checked by whoever uses it).
  void check() const;
  std::string describe() const;  // "rank 1 of 2 via 127.0.0.1:29500" (for errors and logs)
};

}  // namespace sheaf
