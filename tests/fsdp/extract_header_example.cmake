# cmake -DIN=fsdp.h -DOUT=header_example.inc -P extract_header_example.cmake
# Copies the example out of the header's opening comment: the lines after the
# one starting "// Example" up to "// End of example.", without their "//"
# and the three spaces of indentation the comment adds. (Read whole, not by
# lines: file(STRINGS) would split C++ lines at their semicolons.)
file(READ "${IN}" text)
string(FIND "${text}" "\n// Example" begin)
string(FIND "${text}" "\n// End of example." end)
if(begin EQUAL -1 OR end EQUAL -1 OR end LESS begin)
  message(FATAL_ERROR "no '// Example' ... '// End of example.' block in ${IN}")
endif()
math(EXPR length "${end} - ${begin}")
string(SUBSTRING "${text}" ${begin} ${length} block)
string(SUBSTRING "${block}" 1 -1 block)              # drop the newline before "// Example"
string(FIND "${block}" "\n" first_newline)
string(SUBSTRING "${block}" ${first_newline} -1 code) # drop the "// Example ..." line
string(REPLACE "\n//   " "\n" code "${code}")  # code lines: "//" and the example's three-space indent
string(REPLACE "\n//" "\n" code "${code}")     # empty comment lines
file(WRITE "${OUT}" "${code}\n")
