// A small WordNet corpus in the package's format, for the tests of the
// corpus loader (synth/wordnet_test.cc) and of jobs that train on it
// (server/job_runner_test.cc).
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace slicesched::synth {

// A small data.noun in WordNet 3.0's format (wndb(5WN)): the license header
// (lines starting with two spaces), then one synset per line with the real
// offsets of the roots the family names (mammal 01861778, bird 01503061).
inline constexpr char kWordNetFixture[] =
    "  1 This software and database is being provided to you, the LICENSEE, by\n"
    "  2 Princeton University under the following license.\n"
    "00015388 03 n 06 animal 0 animate_being 0 beast 0 brute 0 creature 0 fauna 0 001 @ 00004475 n 0000 "
    "| a living organism characterized by voluntary movement\n"
    "01861778 05 n 02 mammal 0 mammalian 0 001 @ 00015388 n 0000 "
    "| any warm-blooded vertebrate having the skin more or less covered with hair\n"
    "02084071 05 n 03 dog 0 domestic_dog 0 Canis_familiaris 0 001 @ 01861778 n 0000 "
    "| a member of the genus Canis that has been domesticated by man\n"
    "02121620 05 n 01 cat 0 001 @ 01861778 n 0000 | feline mammal usually having thick soft fur\n"
    "01503061 05 n 01 bird 0 001 @ 00015388 n 0000 "
    "| warm-blooded egg-laying vertebrates characterized by feathers and forelimbs modified as wings\n"
    "01524359 05 n 01 passerine 0 001 @ 01503061 n 0000 | perching birds mostly small and living near the ground\n"
    "13104059 20 n 01 tree 0 000 | a tall perennial woody plant having a main trunk and branches\n"
    "11669921 20 n 01 flower 0 000 | a plant cultivated for its blooms or blossoms\n"
    "03183080 06 n 01 device 0 000 | an instrumentality invented for a particular purpose\n"
    "07705931 13 n 02 edible_fruit 0 fruit 0 000 | edible reproductive body of a seed plant having sweet flesh\n";

inline std::string WriteWordNetFixture(const std::string& name, const std::string& text) {
  const std::string dir = ::testing::TempDir() + "/" + name;
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/data.noun") << text;
  return dir;
}

}  // namespace slicesched::synth
