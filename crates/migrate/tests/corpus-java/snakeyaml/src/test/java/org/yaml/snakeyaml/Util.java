package org.yaml.snakeyaml;

import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;

/** The helpers of SnakeYAML's own test sources that its examples call. */
public class Util {
  public static String getLocalResource(String name) {
    try (InputStream in = Util.class.getClassLoader().getResourceAsStream(name)) {
      if (in == null) {
        throw new RuntimeException("Can not find " + name);
      }
      return new String(in.readAllBytes(), StandardCharsets.UTF_8);
    } catch (IOException e) {
      throw new RuntimeException(e);
    }
  }

  /** Whether both texts hold the same lines, in any order. */
  public static boolean compareAllLines(String etalon, String output) {
    String[] a = etalon.trim().split("\n");
    String[] b = output.trim().split("\n");
    Arrays.sort(a);
    Arrays.sort(b);
    return Arrays.equals(a, b);
  }
}
