#ifndef BIGMAC_CORE_UTIL_FILES_H_
#define BIGMAC_CORE_UTIL_FILES_H_

#include <cstdint>
#include <string>
#include <vector>

namespace bigmac::util {

// The one place for the rules on user-named paths (docs/reliability.md, "Paths"). Every function
// returns "" when the path is usable, or the problem: the path, what is wrong, and the OS's
// reason where there is one. None of them blocks, allocates more than their limit, or throws.

// "<strerror(error)>": the OS's reason for an errno value.
std::string OsReason(int error);

// Opens a user-named input for reading, the one way BigMac opens a file it reads (every reader
// goes through here or through the two functions below). The open never blocks (a fifo with no
// writer would wait forever, and a stop signal would not end the wait), and the kind and size are
// checked on the open descriptor, so the file checked is the file read: only a regular file of at
// most `max_bytes` is accepted. On success returns "" with *fd open (the caller closes it) and
// *size its size; else the problem, naming the file by `path` and its role by `what`.
std::string OpenUserFile(const std::string& path, uint64_t max_bytes, const std::string& what,
                         int* fd, uint64_t* size);

// Reads the whole of a user-named input into *contents. Only a regular file is read (a fifo,
// a device or a socket could block forever or never end), and never more than `max_bytes`
// (the limit is applied to the bytes read, not to a size the file reports). `what` names the
// file's role in messages ("config file", "token shard").
std::string ReadUserFile(const std::string& path, uint64_t max_bytes, const std::string& what,
                         std::string* contents);

// Whether `path` is a regular file that can be opened for reading, without reading it (for
// readers that are not ours, such as dlopen).
std::string CheckUserFile(const std::string& path, const std::string& what);

// A path read from a file (a manifest's model name) is resolved first, then confined: `name`
// must be relative, and `dir`/`name` with every symbolic link and `..` resolved must lie inside
// `dir`'s own resolved path. On success returns "" and the resolved path in *resolved; else the
// problem ("'../x' resolves to /x, outside /data"), which callers prefix with the file that holds
// the name.
std::string ResolveInside(const std::string& dir, const std::string& name, std::string* resolved);

// An output directory: an existing directory that this process can create files in, or a path
// that can be created (its nearest existing ancestor is a writable directory and every name fits
// the OS's limits, and no part of it is a symbolic link to nothing, which stat() reports as a free
// name but mkdir() cannot create through). Nothing is left behind by the check.
std::string CheckOutputDir(const std::string& path);

// An output file: not a directory nor a special file, and its directory passes CheckOutputDir.
// A symbolic link is checked where it leads (WrittenPath), dangling or not.
std::string CheckOutputFile(const std::string& path);

// Creates `dir` and its missing parents (mkdir -p, 0777 less the umask). Returns the directories
// it made, innermost first, for RemoveCreatedDirectories; *problem is set on failure.
std::vector<std::string> CreateDirectories(const std::string& dir, std::string* problem);
// Removes the directories CreateDirectories made while they are empty (a failed output leaves
// nothing behind); stops at the first that is not.
void RemoveCreatedDirectories(const std::vector<std::string>& created);

// Where a write to the file `path` lands: `path`, or where its chain of symbolic links leads
// (relative links resolved from their own directory), existing or not. Writers replace that
// file, so a link the user made to another disk keeps working. "" or the problem (a loop).
std::string WrittenPath(const std::string& path, std::string* target);

}  // namespace bigmac::util

#endif  // BIGMAC_CORE_UTIL_FILES_H_
