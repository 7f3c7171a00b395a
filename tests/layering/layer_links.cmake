# The link graph of the build, written for tests/layering/layer_order_test.sh, which holds
# docs/ARCHITECTURE.md's layer table to it.
#
# zinf_write_layer_links(FILE) writes one line per target the build defines:
#   <target> TAB <its folder, relative to the repository> TAB <the targets of ours it links>
# The links are the target's own, public and private (LINK_LIBRARIES and
# INTERFACE_LINK_LIBRARIES), with aliases resolved; imported targets (other projects') and plain
# library names are left out. It must run after every folder has defined its targets and links:
# tests/CMakeLists.txt defers it to the end of the top-level directory.

# Every target defined in `dir` and the folders under it.
function(zinf_targets_under dir out)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    zinf_targets_under(${sub} below)
    list(APPEND targets ${below})
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
endfunction()

# The targets of ours named in a link list. Its items may be generator expressions
# ($<LINK_ONLY:x>, $<$<BOOL:...>:x>): every name inside them that is a target counts, whatever
# the condition, since the layer order must hold in every configuration.
function(zinf_linked_targets links out)
  set(deps)
  string(REGEX MATCHALL "[A-Za-z0-9_.+:-]+" names "${links}")
  foreach(name IN LISTS names)
    if(NOT TARGET ${name})
      continue()
    endif()
    get_target_property(aliased ${name} ALIASED_TARGET)
    if(aliased)
      set(name ${aliased})
    endif()
    get_target_property(imported ${name} IMPORTED)
    if(NOT imported)
      list(APPEND deps ${name})
    endif()
  endforeach()
  set(${out} ${deps} PARENT_SCOPE)
endfunction()

function(zinf_write_layer_links file)
  zinf_targets_under(${PROJECT_SOURCE_DIR} targets)
  set(lines)
  foreach(target IN LISTS targets)
    get_target_property(type ${target} TYPE)
    if(type STREQUAL "UTILITY")  # custom targets link nothing
      continue()
    endif()
    get_target_property(dir ${target} SOURCE_DIR)
    file(RELATIVE_PATH folder ${PROJECT_SOURCE_DIR} ${dir})
    set(links)
    foreach(property LINK_LIBRARIES INTERFACE_LINK_LIBRARIES)
      get_target_property(value ${target} ${property})
      if(value)
        list(APPEND links ${value})
      endif()
    endforeach()
    zinf_linked_targets("${links}" deps)
    list(REMOVE_DUPLICATES deps)
    list(REMOVE_ITEM deps ${target})
    list(JOIN deps " " deps)
    string(APPEND lines "${target}\t${folder}\t${deps}\n")
  endforeach()
  file(WRITE ${file} "${lines}")
endfunction()
